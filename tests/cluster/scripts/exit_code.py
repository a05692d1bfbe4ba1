"""sys.exit with the code given for this rank: --codes 0,3 exits 0 on rank 0, 3 on rank 1."""

import os
import sys

codes = sys.argv[sys.argv.index("--codes") + 1].split(",")
code = codes[int(os.environ["RANK"])]
print("exiting with", code)
sys.exit(None if code == "none" else int(code))
