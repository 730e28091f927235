"""KubeVirt: VirtualMachine manifests and the objects they reference, read into the model."""
