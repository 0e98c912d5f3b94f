"""Prague (Ripples, ASPLOS'20): asynchronous decentralized training by Partial All-Reduce.

After its local update each worker gets a group and averages its model with the group's
members (P-Reduce). Groups come from a Group Generator: a fixed conflict-free schedule computed
by every worker (static.py), or a gRPC service (service.py) over pure decision code
(generator.py) that makes random conflict-free groups and leaves stragglers out (smart.py), or
plain random groups (random.py, the ablation).
"""
