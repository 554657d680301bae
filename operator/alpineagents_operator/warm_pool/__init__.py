"""The warm pool: the waiting standby pods, and handing a run to one."""
