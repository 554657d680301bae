"""Pure decisions: the decision table and its moves, how a pod ended, the status written, what a notification says, a schedule's next step."""
