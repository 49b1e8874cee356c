#!/usr/bin/env python3
"""Export scikit-learn's bundled handwritten digits (8x8 images, 10 classes, 1797 samples) as
NumPy .npy files that mgpu-worker reads with dataset = npy (see configs/digits.cfg).

    python3 scripts/export_digits.py [OUTDIR]      # default: data/ at the repository root

Writes OUTDIR/digits_x.npy (float32, shape (1797, 64), pixel values scaled from 0..16 to 0..1)
and OUTDIR/digits_y.npy (int64, shape (1797,), the digit). Needs numpy and scikit-learn
(Debian: apt-get install python3-sklearn); the data ships with scikit-learn, nothing is
downloaded.
"""
import os
import sys

try:
    import numpy as np
    from sklearn.datasets import load_digits
except ImportError as e:  # say what to install rather than print a traceback
    sys.exit(f"export_digits.py: {e}; install numpy and scikit-learn (apt-get install python3-sklearn)")

here = os.path.dirname(os.path.abspath(__file__))
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(here, "..", "data")
os.makedirs(out, exist_ok=True)
d = load_digits()
x = (d.data / 16.0).astype(np.float32)
y = d.target.astype(np.int64)
np.save(os.path.join(out, "digits_x.npy"), x)
np.save(os.path.join(out, "digits_y.npy"), y)
print(f"wrote {os.path.join(out, 'digits_x.npy')} {x.shape} {x.dtype} and "
      f"{os.path.join(out, 'digits_y.npy')} {y.shape} {y.dtype}")
