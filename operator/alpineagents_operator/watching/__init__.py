"""What the watches showed and whether it needs a step: views of every run and pod, triage, the start's resumes, runs refused before any store is read."""
