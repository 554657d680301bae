"""The stores' policy and the per-run credentials: where the operator's key may go, STS sessions, the issuer, the run stores, what is done to a saved State."""
