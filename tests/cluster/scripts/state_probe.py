"""Changes everything a process's exit would throw away, and prints what it saw."""

import atexit
import json
import os
import signal
import sys

import torch
import torch.distributed as dist

dist.init_process_group()  # no arguments: the environment's (env://), adopted
atexit.register(print, "registered first")
atexit.register(print, "registered second")
atexit.register(print, "unregistered")
atexit.unregister(print)  # removes all three, as atexit.unregister does
atexit.register(lambda: print("atexit: registered earlier, runs last"))
atexit.register(print, "atexit: registered last, runs first")

seen = {
    "argv": sys.argv,
    "cwd": os.getcwd(),
    "path0": sys.path[0],
    "name": __name__,
    "env": {k: v for k, v in os.environ.items() if k.startswith(("TORCHELASTIC_", "ROLE_"))}
    | {
        k: os.environ[k]
        for k in (
            "RANK",
            "LOCAL_RANK",
            "GROUP_RANK",
            "LOCAL_WORLD_SIZE",
            "GROUP_WORLD_SIZE",
            "WORLD_SIZE",
            "MASTER_ADDR",
            "MASTER_PORT",
        )
    },
}
print(json.dumps(seen))
sub = dist.new_group([0, 1])  # destroyed at the script's end
t = torch.ones(1)
dist.all_reduce(t, group=sub)
os.environ["WB_SCRIPT_SET_THIS"] = "1"
os.environ.pop("WB_SET_BEFORE_THE_SCRIPT", None)
sys.path.append("/nonexistent-wb-script-folder")
os.chdir("/")
signal.signal(signal.SIGUSR1, lambda *_: None)
signal.signal(signal.SIGINT, signal.SIG_IGN)
torch.set_num_threads(torch.get_num_threads() + 1)
dist.destroy_process_group()
