"""All that runs in or beside the training process.

The context and decorator (`context`), notices (`signals`, `queue_link`), the deadline and save
interval, the resumable sampler, RNG states, DataLoader workers, torchrun glue (`env`,
`elastic`, `launch`), the cost file, the reporters and the sidecar. Users import the public face
from `preemptible`; these modules are its implementation. Nothing here is imported eagerly, so
importing the package costs nothing.
"""
