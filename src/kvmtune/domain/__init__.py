"""libvirt domain XML: safe parsing and the Guest view."""
