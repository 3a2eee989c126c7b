"""Routing: worker sets, occupancy, selection, fault detection, exclusions, the streaming
seam and the PushRouter (SET, SEL, DSP, FLT)."""
