"""Dataset contracts: the shipped Fleet datasets, users' contract files."""
