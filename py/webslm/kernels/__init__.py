"""WGSL kernel families: the registry and the host side of each kernel."""
