"""What the ledger says, for people and scripts: status, the per-arm report, its plots, exports."""
