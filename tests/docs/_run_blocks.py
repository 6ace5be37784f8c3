"""Run one page's Python blocks in order in one namespace, as a reader would run them.

Usage: python _run_blocks.py BLOCKS.json. Tracebacks name the page and its line numbers.
"""

import json
import sys

if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as fh:
        blocks = json.load(fh)
    namespace = {"__name__": "__main__"}
    for block in blocks:
        code = "\n" * (block["line"] - 1) + block["code"]  # line numbers as on the page
        exec(compile(code, block["page"], "exec"), namespace)
    print(f"ran {len(blocks)} block(s)")
