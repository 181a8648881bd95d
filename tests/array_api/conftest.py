"""Array API client tests: scikit-learn's array API mode needs scipy's, switched on before scipy
is first imported."""

from __future__ import annotations

import os

os.environ.setdefault("SCIPY_ARRAY_API", "1")
