"""Engine: the framework-free serving machine — the native kernels, the ring of host buffers,
which records a step holds, building a step into a buffer, the producer threads, `HostLoader`."""
