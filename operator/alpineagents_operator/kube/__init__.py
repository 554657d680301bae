"""The Kubernetes vocabulary and API: typed views, the API calls, the pod manifest, settings, metrics, the admission ledger, resource caps, Kueue's Workloads."""
