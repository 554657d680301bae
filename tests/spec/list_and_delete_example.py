from alpineagents import FileStore

store = FileStore(".agent-runs")

for saved in store.list():  # a StateInfo for each, most recently updated first
    print(saved.id, saved.first_message, saved.updated_at, saved.stopped)

store.delete("review-pr-42")

runs = [saved for saved in store.list() if saved.parent_id is None]
print([saved.id for saved in runs])
