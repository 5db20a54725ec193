"""The deployment recommender: requirements in, priced and checked fleets out (see search)."""
