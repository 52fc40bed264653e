"""What the notebook calls on the engines: the agent and the reads relay."""
