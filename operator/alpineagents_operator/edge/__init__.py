"""The process's edge: kopf's handlers (thin), the Lease election and the standby's wait."""
