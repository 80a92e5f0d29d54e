"""`burstbuffer`: the operators' command line, on the `kubernetes` client.

`status` reads every injected pod's `/stats` through the API server's pod proxy;
`check` tells whether the injector is installed and would inject a namespace's pods.
Layers: `cli` (flags -> OpsSettings, exit codes) on top; `status` and `check` (pure
decisions, plus one `run` each at the edge); `kube` (the API calls, plain dicts in and
out) and `output` (tables, JSON, YAML) at the bottom.
"""
