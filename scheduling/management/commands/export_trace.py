"""``manage.py export_trace DIR``: the live history in the simulator's formats."""

from django.core.management.base import BaseCommand, CommandError

from scheduling.services.export import export_trace


class Command(BaseCommand):
    help = "Write nodes.csv, jobs.csv, quotas.csv and events.jsonl (simulator formats) into DIR."

    def add_arguments(self, parser):
        parser.add_argument("directory")

    def handle(self, *args, directory: str, **options):
        try:
            counts = export_trace(directory)
        except OSError as exc:
            raise CommandError(f"cannot write to {directory}: {exc}") from exc
        # A cluster still at work has jobs that never end in the trace: the checker, told so.
        unfinished = " --unfinished-ok" if counts["unfinished"] else ""
        self.stdout.write(
            f"wrote {counts['nodes']} nodes, {counts['jobs']} jobs, {counts['events']} events "
            f"to {directory}; check with: python -m scheduling.sim check{unfinished} {directory}/nodes.csv "
            f"{directory}/jobs.csv {directory}/events.jsonl {directory}/quotas.csv"
        )
