"""ungater: carries out the fair scheduler's release decisions in the worker clusters.

Why a separate service: removing a gate is the one write lockgate makes to a user's pod, and it
must be safe to repeat (commands arrive at least once), fast (release throughput is bounded by
the apiserver, so many patches are in flight per cluster) and honest (every command ends in an
outcome — ungated, pod gone, or failed so the job goes back to its queue — published before the
command's offset is committed).
"""
