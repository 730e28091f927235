"""Windows guest rules (KVM-WIN-NNN): Hyper-V enlightenments and clock timers for guests that
:func:`kvmtune.domain.windows.windows_hint` takes for Windows."""
