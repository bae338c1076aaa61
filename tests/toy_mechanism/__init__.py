"""A mechanism added from outside the package, exactly as docs/adding-a-mechanism.md
says a contributor adds one: its math (:mod:`.functional`) and its registration
(:mod:`.mechanism`). Importing :mod:`.mechanism` registers it."""
