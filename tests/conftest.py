import os

# Tests keep everything on this machine: Ray (when used) binds to loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


def pytest_collection_modifyitems(config, items):
    """With pytest-xdist (`-n 2`, `--dist loadgroup`), every test that starts Ray runs on one worker, one
    after another: their checks count the machine's Ray actor processes, and two local Rays would share it."""
    import pytest

    for item in items:
        if "ray" in item.nodeid.lower():
            item.add_marker(pytest.mark.xdist_group("ray"))
