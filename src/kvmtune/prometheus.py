"""node_exporter textfile-collector output: gauges with HELP and TYPE lines, label values escaped."""

from __future__ import annotations

from kvmtune.textsafe import safe


def _label(value: str) -> str:
    """A label value others may have written (a domain name, a database string): control characters shown as
    ``\\xNN`` first (the file is read by people too, with cat), then the exposition format's own escapes."""
    shown = "\n".join(safe(part) for part in value.split("\n"))  # a newline keeps the format's own \\n
    return shown.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Samples grouped by metric family, in the order families were first added."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, list[str]]] = {}

    def add(self, name: str, help_text: str, labels: dict[str, str], value: float) -> None:
        _, samples = self.families.setdefault(name, (help_text, []))
        inner = ",".join(f'{k}="{_label(v)}"' for k, v in labels.items())
        samples.append(f"{name}{{{inner}}} {value:.9g}" if inner else f"{name} {value:.9g}")

    def text(self) -> str:
        out = []
        for name, (help_text, samples) in self.families.items():
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} gauge")
            out.extend(samples)
        return "\n".join(out) + "\n"
