"""The image's HEALTHCHECK: GET a health URL, exit 0 on HTTP 200, 1 otherwise.

The URL is DTQ_HEALTHCHECK_URL when set (e.g. dtq-api's http://127.0.0.1:8000/healthz), else the
worker's own http://127.0.0.1:$DTQ_METRICS_PORT/healthz. Standard library only.
"""

import os
import sys
import urllib.request

url = os.environ.get("DTQ_HEALTHCHECK_URL") or (
    f"http://127.0.0.1:{os.environ.get('DTQ_METRICS_PORT', '9191')}/healthz"
)
try:
    with urllib.request.urlopen(url, timeout=4) as r:
        sys.exit(0 if r.status == 200 else 1)
except Exception as exc:
    print(f"unhealthy: {url}: {exc}", file=sys.stderr)
    sys.exit(1)
