"""The conformance run: cases (traces, attention, workloads, fuzz slices),
the gate verb run as pytest items (run.py, pytest_plugin.py), and the same on
a Ray cluster (on_ray.py)."""
