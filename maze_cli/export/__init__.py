"""A trained policy as a file that runs without maze_cli: `export-policy` (ONNX or TorchScript), the I/O
contract it follows (`contract`), the graph it traces (`graph`, `heads`) and the check against the trained
policy before anything is written (`parity`). docs/deploying.md is the user's side of it."""
