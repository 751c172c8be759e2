from __future__ import annotations

import torch

# Tiny test models run fastest on one thread, and several test processes (or an editor's
# language server) sharing two cores make multi-threaded spin-waits very slow.
# Tests on the real packaged models raise this again for their own duration.
torch.set_num_threads(1)
