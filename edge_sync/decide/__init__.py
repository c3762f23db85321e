"""Pure decisions of the device: no I/O, no clock of their own, table-tested.

``plan`` what an update fetches, ``health`` the gate's verdict, ``gate_state`` what a
gate's close, a rollback or a start-up records, ``restarts`` what a start does with a
version that was being tried, ``schedule`` when to look again.
"""
