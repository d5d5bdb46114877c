"""Rewards and canonical state (layer 0: pure, no toolkit imports above schema): `state` is the one
canonical form for state hashes and DIFF, `rewards` the reward functions verify and training share."""
