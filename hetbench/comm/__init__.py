"""Transport: Comm (collectives, groups formed on the fly, point to point over
torch.distributed) and the rendezvous of the local launcher, torchrun and mpirun."""
