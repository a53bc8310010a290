"""What proposes each step's guesses: one drafter per decoding method (drafter.py says what a drafter is to the loop),
and the draft parts a decoder loaded them from."""
