#!/usr/bin/env python3
"""`./{TOOL}`: ask the environment to {TOOL} model_new.py and kernels/ (the same as the {TOOL} tool).

There is no judge in here: this only sends a request over the environment's socket and prints the
answer. The judge runs outside your sandbox, on the files as they are in the workdir.
"""
import json
import os
import socket
import sys

os.chdir(os.path.dirname(os.path.abspath(__file__)))
try:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(".cudagym/env.sock")
    conn.sendall(json.dumps({"tool": "{TOOL}"}).encode() + b"\n")
    reply = b""
    while chunk := conn.recv(65536):
        reply += chunk
    answer = json.loads(reply)
except (OSError, ValueError) as e:
    print(f"{TOOL}: the environment did not answer ({e}); use the {TOOL} tool instead", file=sys.stderr)
    sys.exit(2)
print(answer["output"])
sys.exit(0 if answer["ok"] else 1)
