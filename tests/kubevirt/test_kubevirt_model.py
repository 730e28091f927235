"""KubeVirt objects into the model: KubeVirt's defaults, each said to be one, and what a preference changes."""

from __future__ import annotations

from pathlib import Path

from kvmtune.kubevirt.guest import guests_from_objects, quantity
from kvmtune.kubevirt.load import read_file
from kvmtune.model.guest import Guest

VM = """apiVersion: kubevirt.io/v1
kind: VirtualMachine
metadata: {{name: vm, namespace: ns}}
spec:
{extra}  template:
    spec:
      domain:
        cpu: {{cores: 2}}
        devices:
          disks:
          - {{name: root, disk: {{}}}}
          interfaces:
          - {{name: default, masquerade: {{}}}}
      volumes:
      - {{name: root, persistentVolumeClaim: {{claimName: root}}}}
"""
PREFERENCE = """---
apiVersion: instancetype.kubevirt.io/v1beta1
kind: VirtualMachineClusterPreference
metadata: {name: fast}
spec:
  devices: {preferredDiskBus: virtio, preferredDiskDedicatedIoThread: true, preferredInterfaceModel: virtio}
"""


def guest(tmp_path: Path, text: str) -> Guest:
    p = tmp_path / "vm.yaml"
    p.write_text(text)
    guests, _ = guests_from_objects(read_file(str(p)))
    return guests[0]


def test_defaults_are_kubevirts_and_say_so(tmp_path: Path) -> None:
    g = guest(tmp_path, VM.format(extra=""))
    disk, nic = g.disks[0], g.nics[0]
    assert (disk.bus, disk.iothread, disk.queues, str(disk.cache)) == ("sata", None, None, "none")
    assert disk.where("bus").endswith("(not set: KubeVirt's default sata)")
    assert "O_DIRECT" in disk.where("cache")
    assert (nic.model, nic.queues, nic.type) == ("virtio", None, "ethernet")
    assert g.iothreads == 0 and g.cpu_mode == "host-model" and g.machine == "q35" and g.vcpus == 2


def test_a_preference_sets_bus_model_and_dedicated_iothread(tmp_path: Path) -> None:
    g = guest(tmp_path, VM.format(extra="  preference: {name: fast}\n") + PREFERENCE)
    disk = g.disks[0]
    assert disk.bus == "virtio" and disk.iothread is not None and g.iothreads == 1
    assert "preferredDiskDedicatedIoThread" in disk.where("iothread")


def test_an_unresolved_instancetype_leaves_the_vcpus_unstated(tmp_path: Path) -> None:
    text = VM.format(extra="  instancetype: {name: big}\n").replace("        cpu: {cores: 2}\n", "")
    assert guest(tmp_path, text).vcpus is None


def test_quantities() -> None:
    assert quantity("2Gi") == 2 * 2**30 and quantity("500m") == 0.5 and quantity("1e3") == 1000
    assert quantity("64M") == 64e6 and quantity(4) == 4.0
    assert quantity("2 apples") is None and quantity(True) is None and quantity("9" * 50) is None
