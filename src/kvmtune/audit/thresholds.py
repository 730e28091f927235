"""The thresholds sites reasonably disagree on, as rules and the live view read them
(``AuditContext.thresholds``). Each default is cited where it is declared as a setting (audit/settings.py
``KEYS``); a settings file's ``[thresholds]`` table overrides them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Thresholds:
    vcpu_overcommit: float = 4.0  # running vCPUs per host CPU (Nova initial_cpu_allocation_ratio, 2022)
    cpu_utilization: float = 0.80  # fraction of all host CPUs busy (seed 000: target 80 % or lower)
    memory_overcommit: float = 1.0  # guest memory / host RAM (Nova initial_ram_allocation_ratio, 2022)
    run_delay_warn: float = 0.05  # live: run delay, fraction of the interval per vCPU
    run_delay_critical: float = 0.10
    disk_latency_flash_ms: float = 2.0  # live: ms per operation on flash that warns
    disk_latency_hdd_ms: float = 10.0  # live: ms per operation on HDD or network storage that warns
