"""The reconcile loop: the Reconciler and its Actions, places under the caps and Kueue, forks, throttling, notifications sent, finished runs deleted after their TTL, schedules stepped."""
