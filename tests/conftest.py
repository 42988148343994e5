import os

# Tests keep everything on this machine: Ray (when used) binds to loopback only.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
