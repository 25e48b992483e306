"""A small real agent for the command-template worker tests: it asks a model through the proxy and edits files.

Run as `python agent_script.py --prompt-file F --model M --base-url URL [--turns N]`
in the workspace (the dispatch's cwd). It sends one Chat Completions request per
turn with httpx (over `PROCTOR_PROXY_SOCKET` when the sandbox gives one), writes
every `<<<FILE path ... >>>END` block of the answer whose path is in
`PROCTOR_SCOPE`, and prints one JSON line. A 402 naming `budget_stop` ends it
with exit 76, as llm-edit does.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path

import httpx

BLOCK = re.compile(r"^<<<FILE (\S+)\n(.*?)^>>>END$", re.S | re.M)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--prompt-file", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--turns", type=int, default=1)
    args = parser.parse_args()
    scope = json.loads(os.environ.get("PROCTOR_SCOPE", "[]"))
    task_id = os.environ.get("PROCTOR_TASK_ID", "unnamed")
    with open(args.prompt_file, encoding="utf-8") as fh:
        prompt = fh.read()
    socket = os.environ.get("PROCTOR_PROXY_SOCKET")
    transport = httpx.HTTPTransport(uds=socket) if socket else None
    sent, written = 0, list[str]()
    with httpx.Client(transport=transport, timeout=60, trust_env=False) as client:
        for _turn in range(args.turns):
            files = []
            for rel in scope:
                path = Path(os.getcwd(), rel)
                text = path.read_text(encoding="utf-8") if path.exists() else ""
                files.append(f"<<<FILE {rel}\n{text}>>>END")
            content = f"task_id: {task_id}\n\n{prompt}\n\nThe files now:\n" + "\n".join(files) + "\n"
            body = {"model": args.model, "messages": [{"role": "user", "content": content}]}
            response = client.post(args.base_url.rstrip("/") + "/chat/completions", json=body)
            sent += 1
            if response.status_code == 402 and response.json().get("error", {}).get("code") == "budget_stop":
                print(json.dumps({"budget_stop": True, "requests": sent, "written": written}))
                return 76
            if response.status_code != 200:
                print(json.dumps({"status": response.status_code, "requests": sent}))
                return 75
            answer = response.json()["choices"][0]["message"]["content"]
            for rel, text in BLOCK.findall(answer):
                if rel in scope:
                    with open(os.path.join(os.getcwd(), rel), "w", encoding="utf-8") as fh:
                        fh.write(text)
                    written.append(rel)
    print(json.dumps({"budget_stop": False, "requests": sent, "written": sorted(set(written))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
