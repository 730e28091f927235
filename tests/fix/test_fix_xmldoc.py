"""XmlDoc: edits land in the tree and in the original bytes, and nothing else moves."""

from __future__ import annotations

import pytest
from lxml import etree

from kvmtune.domain.xml import parse_xml_bytes
from kvmtune.fix.xmldoc import XmlDoc, XmlEditError


def doc(text: str) -> XmlDoc:
    data = text.encode()
    return XmlDoc(data, parse_xml_bytes(data, "t"), "t")


def el(d: XmlDoc, path: str) -> etree._Element:
    found = d.tree.getroot().find(path)
    assert found is not None
    return found


TRICKY = """<?xml version="1.0"?>
<!-- <disk> in a comment is no element -->
<domain type="kvm" xmlns:qemu='http://libvirt.org/schemas/domain/qemu/1.0'>
  <name>t</name>
  <description><![CDATA[ <not-a-tag attr='x'> ]]></description>
  <?pi stays?>
  <devices>
    <disk device='disk' note="a > b &amp; c"><driver  name = 'qemu'   cache="writeback"/><target dev='vda'/></disk>
    <interface type='bridge'></interface>
  </devices>
  <qemu:commandline><qemu:arg value='-x'/></qemu:commandline>
</domain>
"""


def test_attribute_edits_keep_quotes_spacing_and_neighbours() -> None:
    d = doc(TRICKY)
    drv = el(d, "devices/disk/driver")
    d.set_attr(drv, "cache", "none")
    d.set_attr(drv, "io", "native")
    d.del_attr(drv, "name")
    out = d.render().decode()
    # the value is replaced in its own quotes; a new attribute takes the quote of the tag's first one;
    # a removed attribute takes its leading blanks with it; everything else on the line is as it was
    line = """    <disk device='disk' note="a > b &amp; c"><driver   cache="none" io='native'/><target dev='vda'/></disk>"""
    assert out.splitlines()[7] == line
    assert out.splitlines()[:7] + out.splitlines()[8:] == TRICKY.splitlines()[:7] + TRICKY.splitlines()[8:]


def test_remove_inline_element_and_insert_into_open_close_pair() -> None:
    d = doc(TRICKY)
    d.remove(el(d, "devices/disk/target"))
    d.append(el(d, "devices/interface"), etree.Element("model", type="virtio"))
    out = d.render().decode()
    assert "cache=\"writeback\"/></disk>" in out  # removed from the middle of a line, nothing else taken
    assert "<interface type='bridge'>\n      <model type='virtio'/>\n    </interface>" in out
    assert "<![CDATA[ <not-a-tag attr='x'> ]]>" in out and "<?pi stays?>" in out
    assert "<!-- <disk> in a comment is no element -->" in out


def test_new_elements_stay_editable() -> None:
    d = doc(TRICKY)
    rng = d.append(el(d, "devices"), etree.Element("rng", model="virtio"))
    backend = d.append(rng, etree.Element("backend", model="random"))
    d.set_text(backend, "/dev/random")
    d.set_text(backend, "/dev/urandom")
    d.set_attr(rng, "model", "virtio-non-transitional")
    gone = d.append(el(d, "devices"), etree.Element("watchdog"))
    d.remove(gone)
    out = d.render().decode()
    assert (
        "    <rng model='virtio-non-transitional'>\n      <backend model='random'>/dev/urandom</backend>\n    </rng>\n"
        "  </devices>" in out
    )
    assert "watchdog" not in out


def test_text_edits() -> None:
    d = doc("<domain><name>a</name><vcpu/><memory unit='KiB'>1</memory></domain>")
    d.set_text(el(d, "vcpu"), "4")
    d.set_text(el(d, "memory"), "2")
    d.set_text(el(d, "memory"), "3")
    assert d.render() == b"<domain><name>a</name><vcpu>4</vcpu><memory unit='KiB'>3</memory></domain>"


def test_touched_lines_name_the_edits() -> None:
    d = doc(TRICKY)
    d.set_attr(el(d, "devices/disk/driver"), "cache", "none")
    assert d.take_touched() == [8]
    assert d.take_touched() == []


def test_crlf_documents_get_crlf_insertions() -> None:
    d = doc("<domain>\r\n  <devices>\r\n    <disk/>\r\n  </devices>\r\n</domain>\r\n")
    d.append(el(d, "devices"), etree.Element("rng"))
    d.remove(el(d, "devices/disk"))
    assert d.render() == b"<domain>\r\n  <devices>\r\n    <rng/>\r\n  </devices>\r\n</domain>\r\n"


def test_append_after_removing_the_last_children() -> None:
    d = doc("<domain>\n  <devices>\n    <a/>\n    <b/>\n    <c/>\n  </devices>\n</domain>\n")
    d.remove(el(d, "devices/c"))
    d.append(el(d, "devices"), etree.Element("rng"))
    d.remove(el(d, "devices/b"))
    assert d.render() == b"<domain>\n  <devices>\n    <a/>\n    <rng/>\n  </devices>\n</domain>\n"


def test_unchanged_document_renders_identically() -> None:
    d = doc(TRICKY)
    assert not d.changed
    assert d.render() == TRICKY.encode()


def test_foreign_elements_are_refused() -> None:
    d = doc(TRICKY)
    with pytest.raises(XmlEditError):
        d.set_attr(etree.Element("x"), "a", "b")
    with pytest.raises(XmlEditError):
        d.remove(d.tree.getroot())


def test_two_inserts_after_one_sibling_keep_their_order_in_text_and_tree() -> None:
    d = doc("<domain>\n  <os/>\n  <devices/>\n</domain>\n")
    os_el = el(d, "os")
    d.insert_after(os_el, etree.Element("cpu"))
    d.insert_after(os_el, etree.Element("features"))
    out = d.render()
    assert out == b"<domain>\n  <os/>\n  <cpu/>\n  <features/>\n  <devices/>\n</domain>\n"
    assert [c.tag for c in d.tree.getroot()] == ["os", "cpu", "features", "devices"]
