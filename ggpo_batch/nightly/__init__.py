"""Nightly CPU component tiers (l1_mechanism): each method's actual update code on a tiny byte
policy, recorded like seeds/003. Entry points: `nightly.run_nightly`, `record.check_component_record`,
`night.run_night` (ledger-recorded), `schedule` (RQ cron / enqueue_at), `status.component_status`."""
