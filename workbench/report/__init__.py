"""Self-contained HTML reports of runs and plans (plotly.js embedded once, works offline)."""

from workbench.report.html import ReportSection, figure_div_id, render_report, write_report

__all__ = ["ReportSection", "figure_div_id", "render_report", "write_report"]
