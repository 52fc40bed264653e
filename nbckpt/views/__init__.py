"""Views of an operation computed once from its journal, for widgets and the server."""
