"""Profiles tab: the card's three profiles (figures, honest notes, chart), the equivalent `docker run`,
the studies behind the numbers, and the custom-profile editor (clone → edit knobs → warnings → save)."""

from __future__ import annotations

from html import escape
from typing import Any, Literal

import gradio as gr

from app.backend.contracts import count_text
from app.backend.profiles import custom as cp
from app.backend.recipe.command import CommandError, explain_lines, render_shell
from app.backend.recipe.schema import ProfileSpec
from app.backend.selftest.report import Standing
from app.backend.jobs import JobState
from app.backend.state import AppState
from app.ui.shell import Shell
from app.ui.profile_html import (
    card_facts,
    explained_command,
    glyphs,
    findings_list,
    profile_cards,
    speed_quality_chart,
    study_tables,
)

TITLE = "Profiles"


def _choices(profiles: list[ProfileSpec]) -> list[tuple[str, str]]:
    return [(f"#{p.number} {p.title}" if p.measured else f"{p.title} (custom)", p.id) for p in profiles]


class _View:
    """Handlers bound to one AppState (no globals): each reads the profiles from the one registry (re-read when
    the custom-profile folder changes)."""

    def __init__(self, state: AppState) -> None:
        self.state = state
        self.recipe = state.settings.recipe

    def profiles(self) -> list[ProfileSpec]:
        return self.state.profiles.list()

    def _find(self, pid: str) -> ProfileSpec:
        return self.state.profiles.find(pid) or self.recipe.recommended_profile

    def command(self, pid: str, plain: bool) -> tuple[str, str]:
        """The copyable shell text and the same lines beside the card's reason for each."""
        engine = self.state.engine
        if engine is None:
            return "# engine control is not available in this build: no command to show", ""
        try:  # the engine's own spec: exactly what Start runs (panel settings included)
            spec = engine.run_spec(pid, plain=plain)
        except (KeyError, CommandError) as exc:
            return f"# cannot build the command: {exc}", ""
        head = "# SIMULATED engine image (demo mode)\n" if self.recipe.simulated else ""
        return head + render_shell(spec), explained_command(explain_lines(self.recipe, spec))

    def standings(self, profiles: list[ProfileSpec]) -> dict[str, Standing | None] | None:
        """This box's latest self-test of each profile (None: no self-test service in this build)."""
        svc = self.state.selftest
        return {q.id: svc.standing(q.id) for q in profiles} if svc is not None else None

    def cards(self, pid: str) -> str:
        profiles = self.profiles()
        findings = {q.id: cp.findings_for(self.recipe, q) for q in profiles}
        return profile_cards(self.recipe, profiles, self._find(pid).id, findings, self.standings(profiles))

    def selftest_label(self, pid: str) -> tuple[str, Literal["primary", "secondary"]]:
        """'Run it again' for the selected profile; the primary action when its stored result is stale."""
        svc = self.state.selftest
        p = self._find(pid)
        st = svc.standing(p.id) if svc is not None else None
        if st is None:
            return f"Self-test {p.title} on this box", "secondary"
        if st.stale:
            return f"Run the self-test of {p.title} again: its setup changed", "primary"
        return f"Run the self-test of {p.title} again", "secondary"

    def selftest_button(self, pid: str) -> Any:
        label, variant = self.selftest_label(pid)
        return gr.Button(label, variant=variant)

    def run_selftest(self, pid: str) -> tuple[Any, str]:
        """Start the self-test of this profile (the same plan as its last result) and go to the Self-test tab.
        It runs on the engine as it is: refused, with what to do first, unless the engine serves this profile
        (the self-test never starts, switches or restarts it)."""
        svc = self.state.selftest
        if svc is None:
            return gr.skip(), "The self-test is not available in this build."
        p = self._find(pid)
        plan = svc.rerun_plan(p.id)
        prog = svc.start(plan)
        if prog.state is JobState.RUNNING:
            return (gr.Tabs(selected="selftest"),
                    f"Self-test of **{escape(p.title)}** started ({count_text(plan.runs, 'decode run')} of {plan.decode_tokens:,} tokens, "
                    f"about {svc.estimate_s(plan) / 60:.1f} min): follow it on the Self-test tab.")
        return gr.skip(), f"⚠️ {escape(prog.message)}"

    def select(self, pid: str, plain: bool) -> tuple[str, str, str, str, str]:
        profiles = self.profiles()
        p = self._find(pid)
        findings = {q.id: cp.findings_for(self.recipe, q) for q in profiles}
        text, why = self.command(p.id, plain)
        return (
            self.cards(p.id),
            speed_quality_chart(self.recipe, profiles, p.id),
            text,
            findings_list(findings[p.id], f"{p.title}", cp.expert_risks(p)),
            why,
        )

    def load_form(self, base_id: str) -> list[Any]:
        f = cp.form_from_profile(self.recipe, self._find(base_id))
        return [f.policy, f.promo_hyst, f.delta_promote, f.delta_gb, f.gate, f.max_model_len, f.enforce_eager, f.speculative,
                "", f.max_num_seqs, f.expert]

    def _form(self, *vals: Any) -> cp.EditorForm:
        policy, hyst, promote, gb, gate, mml, eager, spec, extra, seqs, expert = vals
        return cp.EditorForm(policy or "", hyst or "", promote or "", gb or "", bool(gate), mml or "", bool(eager), spec or "",
                             extra or "", seqs or "", bool(expert))

    def check(self, base_id: str, name: str, *vals: Any) -> tuple[str, str]:
        try:
            preview = cp.profile_from_form(self.recipe, self._find(base_id), name or "preview", self._form(*vals), set(),
                                           strict=True)
        except cp.CustomProfileError as exc:
            return "", f"⚠️ {escape(str(exc))}"
        found = cp.findings_for(self.recipe, preview)
        return (findings_list(found, "this custom profile", cp.expert_risks(preview)),
                f"Changes vs the card's base command: `{preview.scheduler_setting}`. Not measured.")

    def save(self, base_id: str, name: str, plain: bool, *vals: Any, anyway: bool = False) -> list[Any]:
        """Save the form as a custom profile. One the card calls an ERROR (e.g. 10 GiB does not fit at 256K) is
        not saved on the first click: the warnings are shown and **Save anyway** asks (issue 49: it saved without
        asking). Returns (selector, base, findings, status, the Save anyway button)."""
        taken = {p.id for p in self.profiles()}
        try:
            profile = cp.profile_from_form(self.recipe, self._find(base_id), name, self._form(*vals), taken, strict=True)
            found = cp.findings_for(self.recipe, profile)
            errors = [f for f in found if f.severity == "error"]
            if errors and not anyway:
                listed = findings_list(found, profile.title, cp.expert_risks(profile))
                return [gr.update(), gr.update(), listed,
                        f"⚠️ **Not saved yet:** the card calls {len(errors)} of these settings an ERROR "
                        f"({escape(', '.join(f.id for f in errors))}). Change them, or press **Save anyway**.",
                        gr.update(visible=True)]
            path = cp.save_custom_profile(self.state.settings, profile)
        except (cp.CustomProfileError, OSError) as exc:
            return [gr.update(), gr.update(), "", f"⚠️ Not saved: {escape(str(exc))}", gr.update(visible=False)]
        choices = _choices(self.profiles())
        msg = (f"Saved custom profile **{escape(profile.title)}** (`{profile.id}`) to `{path}`. "
               "It is not measured: no figures are shown for it.")
        return [gr.update(choices=choices, value=profile.id), gr.update(choices=choices),
                findings_list(found, profile.title, cp.expert_risks(profile)), msg, gr.update(visible=False)]

    def delete(self, pid: str) -> list[Any]:
        p = self._find(pid)
        if p.measured or not cp.delete_custom_profile(self.state.settings, pid):
            return [gr.update(), gr.update(), "Select a custom profile above to delete it (the card's profiles cannot be deleted)."]
        choices = _choices(self.profiles())
        rec = self.recipe.recommended_profile.id
        return [gr.update(choices=choices, value=rec), gr.update(choices=choices), f"Deleted custom profile `{pid}`."]


def render(state: AppState, shell: Shell) -> None:
    view = _View(state)
    recipe = view.recipe
    profiles = view.profiles()
    rec = recipe.recommended_profile.id
    cards0, chart0, cmd0, find0, why0 = view.select(rec, False)
    report = cp.load_custom_profiles_report(state.settings)

    intro = f"**{recipe.title}** — figures, notes and warnings are the model card's own words."
    if recipe.simulated:
        intro += " **SIMULATED**: demo mode serves these profiles with the simulated engine."
    gr.Markdown(intro, elem_id="profiles-intro")
    if report.problems:
        gr.Markdown("⚠️ " + "  \n".join(report.problems), elem_id="custom-profile-problems")
    selector = gr.Radio(_choices(profiles), value=rec, label="Profile", elem_id="profile-select")
    with gr.Row(elem_id="profile-selftest-row"):  # the selected profile's self-test, right above its card
        label0, variant0 = view.selftest_label(rec)
        st_btn = gr.Button(label0, variant=variant0, elem_id="profile-selftest-run", scale=0, min_width=380)
        st_msg = gr.Markdown("", elem_id="profile-selftest-msg")
    cards = gr.HTML(cards0, elem_id="profile-cards-html")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=300):
            chart = gr.HTML(chart0, elem_id="profile-chart")
            gr.Markdown("**Card warnings for the selected profile**")
            findings = gr.HTML(find0, elem_id="profile-findings")
        with gr.Column(scale=1, min_width=300):
            plain = gr.Checkbox(False, label="Plain: exactly the card's command (no panel labels or trace env)", elem_id="command-plain")
            # A read-only textarea, not gr.Code: CodeMirror only puts visible lines in the DOM, which breaks
            # select-all, screen readers and the browser tests; the copy button is Gradio's own.
            command = gr.Textbox(cmd0, label="Equivalent docker run", interactive=False, buttons=["copy"], lines=16,
                                 max_lines=40, elem_id="profile-command", elem_classes=["moet-code"])
    with gr.Accordion("Why each line of the command (the card's “Why each knob”)", open=True, elem_id="command-why-box"):
        why = gr.HTML(why0, elem_id="command-why-html")
    with gr.Accordion("Studies behind the figures (full statistics)", open=False, elem_id="studies"):
        gr.HTML(study_tables(recipe.studies), elem_id="study-tables")
    with gr.Accordion("Card facts: context, VRAM, pins, requirements, regeneration", open=False,
                      elem_id="card-facts-box"):
        gr.HTML(card_facts(recipe), elem_id="card-facts-html")

    with gr.Accordion("Custom profile: clone, edit knobs, see the card's warnings, save", open=False, elem_id="custom-editor"):
        gr.Markdown("A custom profile changes the card's knobs; it is saved in the data dir and shown as **not measured**.")
        with gr.Row():
            base = gr.Dropdown(_choices(profiles), value=rec, label="Clone from", elem_id="custom-base")
            name = gr.Textbox(label="New profile name", placeholder="e.g. balanced long-context", elem_id="custom-name")
        f0 = view.load_form(rec)
        def reason(key: str) -> str | None:  # the card's "why each knob" line, shown under each knob
            text = recipe.why.get(key)
            return glyphs(text) if text is not None else None

        with gr.Row():
            policy = gr.Radio(["freq", "need"], value=f0[0], label="VLLM_MOE_W2_DELTA_POLICY", elem_id="knob-policy",
                              info=reason(cp.POLICY_ENV))
            hyst = gr.Textbox(f0[1], label="VLLM_MOE_W2_PROMO_HYST (blank = unset)", elem_id="knob-hyst", info=reason(cp.HYST_ENV))
            promote = gr.Textbox(f0[2], label="VLLM_MOE_W2_DELTA_PROMOTE (blank = unset)", elem_id="knob-promote",
                                 info=reason(cp.PROMOTE_ENV))
            pool = gr.Textbox(f0[3], label="VLLM_MOE_W2_DELTA_GB (FP4 pool GiB)", elem_id="knob-pool", info=reason(cp.POOL_ENV))
        with gr.Row():
            gate = gr.Checkbox(f0[4], label="VLLM_MOE_W2_GATE=1 (confidence gate)", elem_id="knob-gate", info=reason(cp.GATE_ENV))
            mml = gr.Textbox(f0[5], label="--max-model-len", elem_id="knob-max-len", info=reason("--max-model-len"))
            seqs = gr.Textbox(f0[9], label="--max-num-seqs", elem_id="knob-max-seqs", info=reason("--max-num-seqs"))
        with gr.Row():
            eager = gr.Checkbox(f0[6], label="--enforce-eager (no CUDA graphs)", elem_id="knob-eager", info=reason("--enforce-eager"))
            spec = gr.Textbox(f0[7], label="--speculative-config (blank = off)", elem_id="knob-spec",
                              info=reason("--speculative-config"))
        extra = gr.Textbox("", lines=2, label="Other env changes, one per line: NAME=value, or -NAME to unset", elem_id="knob-extra")
        expert = gr.Checkbox(f0[10], label="Expert: allow engine switches that open the engine to its clients or load code "
                             "(VLLM_SERVER_DEV_MODE, VLLM_ALLOW_INSECURE_SERIALIZATION, …); each one is warned about",
                             elem_id="knob-expert")
        with gr.Row():
            check_btn = gr.Button("Check warnings", elem_id="custom-check")
            save_btn = gr.Button("Save custom profile", variant="primary", elem_id="custom-save")
            save_anyway = gr.Button("Save anyway", variant="stop", visible=False, elem_id="custom-save-anyway")
            del_btn = gr.Button("Delete selected custom profile", variant="stop", elem_id="custom-delete")
        custom_findings = gr.HTML("", elem_id="custom-findings")
        status = gr.Markdown("", elem_id="custom-status")

    knobs = [policy, hyst, promote, pool, gate, mml, eager, spec, extra, seqs, expert]
    show: dict[str, Any] = dict(fn=view.select, inputs=[selector, plain], outputs=[cards, chart, command, findings, why],
                                show_progress="hidden")
    selector.change(**show)
    # this box's self-test beside the card's figures: the button follows the selection; the cards are
    # redrawn when the tab is opened again (a self-test may have finished meanwhile)
    selector.change(view.selftest_button, inputs=[selector], outputs=[st_btn], show_progress="hidden")
    if shell.tabs is not None:
        st_btn.click(view.run_selftest, inputs=[selector], outputs=[shell.tabs, st_msg], show_progress="hidden")

        def on_tab(pid: str, evt: gr.SelectData) -> tuple[Any, Any]:
            if evt.value != TITLE:
                return gr.skip(), gr.skip()
            return view.cards(pid), view.selftest_button(pid)

        shell.tabs.select(on_tab, inputs=[selector], outputs=[cards, st_btn], show_progress="hidden")
    plain.change(**show)
    base.change(view.load_form, inputs=[base], outputs=knobs, show_progress="hidden")
    check_btn.click(view.check, inputs=[base, name, *knobs], outputs=[custom_findings, status])
    for k in (policy, gate, eager):
        k.change(view.check, inputs=[base, name, *knobs], outputs=[custom_findings, status], show_progress="hidden")
    save_out = [selector, base, custom_findings, status, save_anyway]
    save_btn.click(view.save, inputs=[base, name, plain, *knobs], outputs=save_out)
    save_anyway.click(lambda *a: view.save(*a, anyway=True), inputs=[base, name, plain, *knobs], outputs=save_out)
    del_btn.click(view.delete, inputs=[selector], outputs=[selector, base, status])
