"""Issue 20 item 7: capture-host redacts every secret syntax QEMU accepts, parsed, not pattern-matched."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvmtune.qemu.argv import split_proc_cmdline
from kvmtune.qemu.redact import redact_arg, redact_cmdline, split_opts

S = "hunter2"

# (option, value) pairs: one per syntax QEMU documents for a secret (docs/system/secrets.rst,
# qapi/block-core.json, docs/system/device-url-syntax.rst.inc).
CASES = [
    ("-object", f"secret,id=s0,data={S},format=raw"),
    ("-object", json.dumps({"qom-type": "secret", "id": "s0", "data": S, "format": "raw"})),
    ("-object", f"secret,id=s0,data=a,,{S},,b"),  # ',,' is a comma inside the value
    ("-object", f"secret,id=s0,data={S},,x,,,format=raw"),
    ("-blockdev", json.dumps({"driver": "iscsi", "transport": "tcp", "portal": "h", "target": "iqn.x:t",
                              "lun": 0, "user": "u", "password": S})),
    ("-blockdev", json.dumps({"driver": "qcow2", "file": {"driver": "http", "url": "http://h/x", "cookie": S}})),
    ("-blockdev", json.dumps({"driver": "raw", "file": {"driver": "https", "url": f"https://u:{S}@h/x"}})),
    ("-drive", f"file=http://u:{S}@h/disk.img,format=raw,if=none"),
    ("-drive", f"file=ssh://root:{S}@h/var/lib/x.img,format=raw"),
    ("-drive", f"file=https://h/x.img,file.cookie={S},format=raw"),
    ("-drive", f"file=https://h/x.img,file.cookie=a=1;,, b={S},format=raw"),
    ("-drive", f"file=iscsi://u%{S}@10.0.0.1/iqn.2001-04.com.example:storage/1,format=raw"),
    ("-drive", f"file=iscsi://u%{S}@10.0.0.1:3260/iqn.2001-04.com.example/1"),
    ("-drive", "file=json:" + json.dumps({"driver": "http", "url": "http://h/x", "cookie": S}).replace(",", ",,")),
    ("-drive", "file=json:" + json.dumps({"driver": "http", "url": "http://h/x", "cookie": S})),  # unescaped commas
    ("-iscsi", f"user=u,password={S},initiator-name=iqn.x"),
    ("-spice", f"port=5900,password={S}"),
    ("-object", f"tls-creds-psk,id=t0,dir=/etc/pki,psk={S}"),
    ("-cdrom", f"ftp://anon:{S}@h/boot.iso"),
    ("-netdev", f"user,id=n0,smb=/srv,guestfwd=tcp:10.0.2.1:80-cmd:curl http://u:{S}@h"),
]


@pytest.mark.parametrize(("opt", "value"), CASES)
def test_every_secret_syntax_is_redacted(opt: str, value: str) -> None:
    data = f"qemu-system-x86_64\0-name\0guest=web01\0{opt}\0{value}\0".encode()
    out, n = redact_cmdline(data)
    assert S.encode() not in out and n >= 1
    argv = split_proc_cmdline(out)
    assert argv[:3] == ["qemu-system-x86_64", "-name", "guest=web01"]  # the rest is kept


def test_references_to_secret_objects_are_kept() -> None:
    value = "driver=iscsi,password-secret=sec0,key-secret=k0,cookie-secret=c0"
    new, n = redact_arg(value)
    assert new == value and n == 0


def test_the_old_patterns_leaks_are_closed() -> None:
    """Each of these leaked through the regular expression that redaction used before."""
    assert S not in redact_arg(f"secret,id=s0,data=x,,{S}")[0]
    assert S not in redact_arg(json.dumps({"qom-type": "secret", "data": S}))[0]
    assert S not in redact_arg(f"file=http://u:{S}@h/x")[0]
    assert S not in redact_arg(f"file.cookie={S}")[0]
    assert S not in redact_arg(f"file=iscsi://u%{S}@h/iqn/0")[0]


def test_split_opts_follows_qemu_comma_escaping() -> None:
    assert split_opts("a=b,,c,d=e") == ["a=b,c", "d=e"]
    assert split_opts("a=,,,,") == ["a=,,"]  # two escaped commas: one value of two commas


secrets = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=6,
                  max_size=40).filter(lambda s: s.strip() == s and "REDACTED" not in s)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(secret=secrets, key=st.sampled_from(["data", "password", "file.cookie", "passwd", "psk", "iv", "secret"]))
def test_any_value_of_a_secret_key_is_redacted(secret: str, key: str) -> None:
    escaped = secret.replace(",", ",,")
    for value in (f"secret,id=s0,{key}={escaped},format=raw", json.dumps({"id": "s0", key.split(".")[-1]: secret})):
        data = f"qemu-system-x86_64\0-object\0{value}\0".encode()
        out, _ = redact_cmdline(data)
        assert secret.encode() not in out.split(b"\0", 2)[2] or secret in "secret,id=s0,format=raw"


PASSWORDS = st.text(alphabet="ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!$&'()*+;=", min_size=6, max_size=20)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(user=st.text(alphabet="abcdefghij", min_size=1, max_size=8),
       password=PASSWORDS.filter(lambda p: p not in "REDACTED"),
       scheme=st.sampled_from(["http", "https", "ftp", "ftps", "ssh", "nbd", "gluster", "iscsi"]))
def test_any_url_password_is_redacted(user: str, password: str, scheme: str) -> None:
    sep = "%" if scheme == "iscsi" else ":"
    url = f"{scheme}://{user}{sep}{password}@host/x"
    for value in (f"file={url},format=raw", url):
        new, n = redact_arg(value)
        assert password not in new and n == 1 and user in new
