"""The lab's storage drivers: fio jobs and their JSON (:mod:`.fio`), several jobs in one fio process (:mod:`.fiobatch`)."""
