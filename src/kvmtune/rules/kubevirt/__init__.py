"""KubeVirt traps: settings only a VirtualMachine manifest has (its own fields, defaults and misplacements)."""
