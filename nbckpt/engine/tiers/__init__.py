"""The local tier (issue 28): hosts as their local directories, and where replicas go."""
