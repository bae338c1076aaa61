"""What did it learn? How far each mechanism's parameters moved in training
(:mod:`.parameter_movement`), what the paper's window configuration attends to once
trained (:mod:`.window`), and how exact each mechanism is in half precision
(:mod:`.precision`).
"""
