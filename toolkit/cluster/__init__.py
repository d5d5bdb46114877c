"""Running the toolkit's streaming commands on more than one machine.

- `toolkit.cluster.ray_shard`: any JSONL command sharded over a Ray cluster (`toolkit ray-shard`).
- Slurm: the job scripts in `recipes/cluster/` (`--shard i/n` array tasks, merge.py).
"""
