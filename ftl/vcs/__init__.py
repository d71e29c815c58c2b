"""Version control: task worktrees, task commits, the integration branch, landing (the only room
that runs git for the runner; see `ftl.vcs.worktrees`)."""
