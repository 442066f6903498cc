//! The live view on a terminal: the interval's table drawn with ratatui, one row selected
//! (Up/Down, PgUp/PgDn, Home/End) and the table scrolled to keep it in sight, the selected
//! row's histograms in a pane (Enter; Enter or Esc closes it), `s` to cycle the sort, `/` to
//! filter, `p` to switch to the processes the interval's stops held (the filtered rows'
//! processes, one line each, most held first) and back, `q` or Ctrl-C to quit. The selection follows its cgroup from one table to the next.
//! State and drawing only: the terminal is [`crate::terminal::Screen`].

use crossterm::event::{Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::{
    Frame,
    layout::{Constraint, Layout},
    style::{Modifier, Style},
    text::Line,
    widgets::{
        Block, Cell, HighlightSpacing, Paragraph, Row as GridRow, Table as Grid, TableState,
    },
};

use super::plain::{self, COLUMNS, HEADER, OWNER, PATH};
use super::rows::{Row, SortKey, Table};

/// Space between two columns.
const SPACING: u16 = 2;
/// Width of the selected row's mark.
const MARK: u16 = 2;

/// Columns printed left-aligned (text); the others are numbers, right-aligned.
const LEFT: [usize; 3] = [PATH, OWNER, COLUMNS - 1];

/// What the terminal shows, between tables and keys.
#[derive(Default)]
pub struct View {
    sort: SortKey,
    /// `/` filter text: only rows whose path or name contain it.
    filter: String,
    /// The filter is being typed.
    typing: bool,
    /// The selected row's histogram pane is open.
    detail: bool,
    /// The per-process table is shown instead of the cgroups' (`p`).
    processes: bool,
    /// The last table, its rows in `sort` order.
    table: Option<Table>,
    selection: TableState,
    /// Rows the table showed at the last draw: what PgUp and PgDn move by.
    page: usize,
}

impl View {
    /// Takes the interval's table in place of the last one.
    pub fn show(&mut self, table: Table) {
        self.keeping_selection(|v| v.table = Some(table));
    }

    /// Acts on a key (see the module doc); true when it ends the run. Other events (a resize)
    /// only need the redraw that follows every event.
    pub fn event(&mut self, event: &Event) -> bool {
        let Event::Key(key) = event else {
            return false;
        };
        if key.kind != KeyEventKind::Press {
            return false;
        }
        // Raw mode turns Ctrl-C into a key: it quits like `q`, also while typing a filter.
        if key.code == KeyCode::Char('c') && key.modifiers.contains(KeyModifiers::CONTROL) {
            return true;
        }
        if self.typing {
            match key.code {
                KeyCode::Enter => self.typing = false,
                KeyCode::Esc => {
                    self.typing = false;
                    self.keeping_selection(|v| v.filter.clear());
                }
                KeyCode::Backspace => self.keeping_selection(|v| {
                    v.filter.pop();
                }),
                KeyCode::Char(c) => self.keeping_selection(|v| v.filter.push(c)),
                _ => {}
            }
            return false;
        }
        let page = isize::try_from(self.page.max(1)).unwrap_or(isize::MAX);
        match key.code {
            KeyCode::Char('q') => return true,
            KeyCode::Char('s') => self.keeping_selection(|v| v.sort = v.sort.next()),
            KeyCode::Char('p') => self.processes = !self.processes,
            KeyCode::Char('/') => {
                self.typing = true;
                self.keeping_selection(|v| v.filter.clear());
            }
            KeyCode::Enter => self.detail = !self.detail,
            KeyCode::Esc => self.detail = false,
            KeyCode::Up => self.move_by(-1),
            KeyCode::Down => self.move_by(1),
            KeyCode::PageUp => self.move_by(-page),
            KeyCode::PageDown => self.move_by(page),
            KeyCode::Home => self.move_by(isize::MIN),
            KeyCode::End => self.move_by(isize::MAX),
            _ => {}
        }
        false
    }

    /// The rows the filter lets through, in sort order.
    fn rows(&self) -> Vec<&Row> {
        let matches = |r: &&Row| {
            self.filter.is_empty()
                || [&r.path, &r.name]
                    .into_iter()
                    .flatten()
                    .any(|t| t.contains(&self.filter))
        };
        self.table
            .iter()
            .flat_map(|t| &t.rows)
            .filter(matches)
            .collect()
    }

    fn selected(&self) -> Option<&Row> {
        self.rows().get(self.selection.selected()?).copied()
    }

    /// Applies `change` to the rows shown, then selects the same cgroup again, or the row at
    /// the same place if it is gone.
    fn keeping_selection(&mut self, change: impl FnOnce(&mut Self)) {
        let id = self.selected().map(|r| r.cgroup_id);
        let place = self.selection.selected().unwrap_or(0);
        change(self);
        if let Some(table) = &mut self.table {
            self.sort.sort(&mut table.rows);
        }
        let rows = self.rows();
        let at = id
            .and_then(|id| rows.iter().position(|r| r.cgroup_id == id))
            .or_else(|| (!rows.is_empty()).then(|| place.min(rows.len() - 1)));
        self.selection.select(at);
    }

    /// Moves the selection by `delta` rows, stopping at the first and the last.
    fn move_by(&mut self, delta: isize) {
        let Some(last) = self.rows().len().checked_sub(1) else {
            return;
        };
        let at = self.selection.selected().unwrap_or(0);
        self.selection
            .select(Some(at.saturating_add_signed(delta).min(last)));
    }

    /// Draws the view on the whole frame: the table's timestamp line, the table (above the
    /// histogram pane when it is open), the keys.
    pub fn draw(&mut self, frame: &mut Frame) {
        let [top, body, bottom] = Layout::vertical([
            Constraint::Length(1),
            Constraint::Min(0),
            Constraint::Length(1),
        ])
        .areas(frame.area());
        let keys = format!(
            "sort: {}  filter: {}{}  (s: sort; /: filter; Up/Down/PgUp/PgDn/Home/End: select; \
             Enter: histograms of the selected row; p: processes held; q or Ctrl-C: quit with \
             the summary)",
            self.sort.as_str(),
            self.filter,
            if self.typing { "_" } else { "" },
        );
        frame.render_widget(Paragraph::new(keys), bottom);
        let Some(table) = &self.table else {
            frame.render_widget(Paragraph::new("waiting for the first interval"), top);
            return;
        };
        frame.render_widget(Paragraph::new(plain::title(table)), top);
        if table.rows.is_empty() {
            frame.render_widget(Paragraph::new(plain::NOTHING_STOPPED), body);
            return;
        }
        if self.processes {
            let title = " processes held in the interval, by held time (p: back to the cgroups) ";
            frame.render_widget(
                Paragraph::new(plain::processes(&self.rows()))
                    .block(Block::bordered().title(title)),
                body,
            );
            return;
        }
        let (grid_area, pane) = match self.selected() {
            Some(row) if self.detail => {
                let [grid, pane] =
                    Layout::vertical([Constraint::Percentage(40), Constraint::Min(0)]).areas(body);
                (grid, Some((pane, row)))
            }
            _ => (body, None),
        };
        if let Some((area, row)) = pane {
            let title = format!(
                " histograms of {} in the interval (Enter or Esc: back) ",
                plain::cells(row, 0.0)[PATH]
            );
            let text = plain::histograms(row);
            frame.render_widget(
                Paragraph::new(text).block(Block::bordered().title(title)),
                area,
            );
        }
        let secs = table.interval.as_secs_f64();
        let cells: Vec<[String; COLUMNS]> =
            self.rows().iter().map(|r| plain::cells(r, secs)).collect();
        let rows_shown = cells.len();
        let header = HEADER.map(String::from);
        let widths: Vec<u16> = (0..COLUMNS)
            .map(|i| {
                let widest = plain::width(std::slice::from_ref(&header), i, 1)
                    .max(plain::width(&cells, i, 1));
                u16::try_from(widest).unwrap_or(u16::MAX)
            })
            .collect();
        let fit = fitting(&widths, grid_area.width.saturating_sub(MARK));
        let line = |texts: [String; COLUMNS]| {
            GridRow::new(texts.into_iter().take(fit).enumerate().map(|(i, t)| {
                let line = Line::from(t);
                Cell::from(if LEFT.contains(&i) {
                    line
                } else {
                    line.right_aligned()
                })
            }))
        };
        let widths = widths[..fit].iter().map(|&w| Constraint::Length(w));
        let grid = Grid::new(cells.into_iter().map(line), widths)
            .header(line(header).style(Style::new().add_modifier(Modifier::BOLD)))
            .column_spacing(SPACING)
            .highlight_symbol("> ")
            .highlight_spacing(HighlightSpacing::Always)
            .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED));
        // The header takes one line of the area.
        self.page = usize::from(grid_area.height.saturating_sub(1));
        // No empty lines under the last row while rows above are scrolled out (after the
        // terminal grew, or rows left the table): ratatui keeps the offset while the selection
        // is in sight.
        let offset = self
            .selection
            .offset()
            .min(rows_shown.saturating_sub(self.page));
        *self.selection.offset_mut() = offset;
        frame.render_stateful_widget(grid, grid_area, &mut self.selection);
    }
}

/// How many of the columns, `widths` wide, fit in `width`: whole columns from the left, as
/// `top` cuts at the right edge, rather than each squeezed into a misleading part of its text
/// (a right-aligned `ms/100.0ms`). The cgroup column is always shown.
fn fitting(widths: &[u16], width: u16) -> usize {
    let mut used = 0u16;
    1 + widths[1..]
        .iter()
        .take_while(|&&w| {
            used = used.saturating_add(SPACING + w);
            widths[0].saturating_add(used) <= width
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::live::rows::tests::{synthetic, table};
    use crossterm::event::KeyEvent;
    use ratatui::{Terminal, backend::TestBackend};

    fn press(view: &mut View, code: KeyCode) -> bool {
        view.event(&Event::Key(KeyEvent::new(code, KeyModifiers::NONE)))
    }

    fn typed(view: &mut View, text: &str) {
        for c in text.chars() {
            assert!(!press(view, KeyCode::Char(c)));
        }
    }

    /// The view drawn on a `width` × `height` terminal, one string per line.
    fn screen(view: &mut View, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|frame| view.draw(frame)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| {
                (0..width)
                    .map(|x| buffer[(x, y)].symbol())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    /// The synthetic aggregate's two rows, /web (more wall-clock stopped) and /batch.
    fn two_rows() -> Table {
        let rows = synthetic()
            .into_iter()
            .map(|interval| Row {
                cgroup_id: interval.cgroup_id,
                path: Some(
                    if interval.cgroup_id == 7 {
                        "/batch"
                    } else {
                        "/web"
                    }
                    .into(),
                ),
                name: None,
                interval,
                periods: None,
                cpus: None,
                settings: None,
            })
            .collect::<Vec<_>>();
        let mut t = table(rows);
        SortKey::default().sort(&mut t.rows);
        t
    }

    /// `n` rows /cg00, /cg01, ..., each stopped less than the one before.
    fn many_rows(n: u64) -> Table {
        let template = two_rows().rows.remove(0);
        let rows = (0..n)
            .map(|i| {
                let mut r = template.clone();
                r.cgroup_id = 100 + i;
                r.path = Some(format!("/cg{i:02}"));
                r.interval.group_stops.sum_ns -= i;
                r
            })
            .collect();
        table(rows)
    }

    /// The line of the table that starts with the selection mark.
    fn selected_line(lines: &[String]) -> &str {
        let mut marked = lines.iter().filter(|l| l.starts_with("> "));
        let line = marked.next().expect("a selected row");
        assert!(marked.next().is_none(), "one selected row: {lines:#?}");
        line
    }

    #[test]
    fn keys_move_the_selection_within_the_rows() {
        let mut view = View::default();
        view.show(many_rows(30));
        let at = |view: &View| view.selected().map(|r| r.path.clone().unwrap());
        assert_eq!(
            at(&view).as_deref(),
            Some("/cg00"),
            "the first row at first"
        );
        press(&mut view, KeyCode::Up);
        assert_eq!(
            at(&view).as_deref(),
            Some("/cg00"),
            "nothing above the first"
        );
        press(&mut view, KeyCode::Down);
        press(&mut view, KeyCode::Down);
        assert_eq!(at(&view).as_deref(), Some("/cg02"));
        // 12 lines: title, header, 9 rows, keys.
        screen(&mut view, 200, 12);
        assert_eq!(view.page, 9);
        press(&mut view, KeyCode::PageDown);
        assert_eq!(at(&view).as_deref(), Some("/cg11"));
        press(&mut view, KeyCode::PageUp);
        assert_eq!(at(&view).as_deref(), Some("/cg02"));
        press(&mut view, KeyCode::End);
        assert_eq!(at(&view).as_deref(), Some("/cg29"));
        press(&mut view, KeyCode::Down);
        assert_eq!(
            at(&view).as_deref(),
            Some("/cg29"),
            "nothing below the last"
        );
        press(&mut view, KeyCode::Home);
        assert_eq!(at(&view).as_deref(), Some("/cg00"));
    }

    #[test]
    fn the_table_scrolls_to_keep_the_selected_row_in_sight() {
        let mut view = View::default();
        view.show(many_rows(30));
        let lines = screen(&mut view, 200, 12);
        assert!(lines[0].starts_with("--- 2027-01-15T08:00:00.000Z  interval 1.00s  30 stopped"));
        assert!(
            lines[1].contains("CGROUP") && lines[1].ends_with("NAME"),
            "{lines:#?}"
        );
        assert!(selected_line(&lines).starts_with("> /cg00 "), "{lines:#?}");
        assert!(lines[10].starts_with("  /cg08 "), "{lines:#?}");
        assert!(
            lines[11].starts_with("sort: wall  filter:   (s: sort;"),
            "{lines:#?}"
        );
        press(&mut view, KeyCode::End);
        let lines = screen(&mut view, 200, 12);
        assert!(selected_line(&lines).starts_with("> /cg29 "), "{lines:#?}");
        assert_eq!(
            lines[10],
            selected_line(&lines),
            "the last row at the bottom"
        );
        assert!(!lines.iter().any(|l| l.contains("/cg00")), "{lines:#?}");
        // Larger: every row fits again, the selection still on the last.
        let lines = screen(&mut view, 200, 40);
        assert!(
            lines.iter().any(|l| l.starts_with("  /cg00 ")),
            "{lines:#?}"
        );
        assert!(selected_line(&lines).starts_with("> /cg29 "), "{lines:#?}");
        assert!(
            lines[39].starts_with("sort: wall"),
            "the keys on the last line"
        );
    }

    #[test]
    fn enter_opens_the_histograms_of_the_selected_row() {
        let mut view = View::default();
        view.show(two_rows());
        press(&mut view, KeyCode::Down);
        press(&mut view, KeyCode::Enter);
        let lines = screen(&mut view, 200, 50);
        let text = lines.join("\n");
        assert!(selected_line(&lines).starts_with("> /batch "), "{text}");
        assert!(
            text.contains("histograms of /batch in the interval"),
            "the second row's pane: {text}"
        );
        assert!(
            text.contains("per-CPU stop lengths in the interval:"),
            "{text}"
        );
        // /batch stopped 10 ms at a time, /web 80 ms.
        assert!(
            text.contains("8 -> 15") && !text.contains("64 -> 127"),
            "{text}"
        );
        // An arrow key moves the selection and the pane follows (its ESC byte is no Esc).
        press(&mut view, KeyCode::Up);
        let text = screen(&mut view, 200, 50).join("\n");
        assert!(
            text.contains("histograms of /web in the interval"),
            "{text}"
        );
        assert!(text.contains("64 -> 127"), "{text}");
        press(&mut view, KeyCode::Esc);
        let text = screen(&mut view, 200, 50).join("\n");
        assert!(
            !text.contains("histograms of /"),
            "Esc closes the pane: {text}"
        );
        press(&mut view, KeyCode::Enter);
        press(&mut view, KeyCode::Enter);
        let text = screen(&mut view, 200, 50).join("\n");
        assert!(!text.contains("histograms of /"), "so does Enter: {text}");
    }

    #[test]
    fn p_switches_to_the_processes_held_and_back() {
        let mut view = View::default();
        view.show(two_rows());
        press(&mut view, KeyCode::Char('p'));
        let text = screen(&mut view, 200, 50).join("\n");
        assert!(text.contains("processes held in the interval"), "{text}");
        // Each stop held tid 101 of pid 100 from 2 µs after its start: /web's 10 stops of
        // 80 ms, then /batch's 20 of 10 ms.
        let web = text.find("stress     10    800.0ms").expect(&text);
        let batch = text.find("stress     20    200.0ms").expect(&text);
        assert!(web < batch, "most held first: {text}");
        assert!(
            text.contains("101:800.0ms") && text.contains("/web"),
            "{text}"
        );
        press(&mut view, KeyCode::Char('p'));
        let text = screen(&mut view, 200, 50).join("\n");
        assert!(
            !text.contains("processes held in") && text.contains("/batch"),
            "{text}"
        );
    }

    #[test]
    fn the_selection_follows_its_cgroup_through_sorts_and_new_tables() {
        let mut view = View::default();
        view.show(two_rows());
        press(&mut view, KeyCode::Down);
        assert_eq!(view.selected().unwrap().cgroup_id, 7);
        // By stops /batch comes first; it stays selected.
        press(&mut view, KeyCode::Char('s'));
        assert_eq!(view.sort, SortKey::Stops);
        assert_eq!(view.rows()[0].cgroup_id, 7);
        assert_eq!(view.selected().unwrap().cgroup_id, 7);
        view.show(two_rows());
        assert_eq!(view.selected().unwrap().cgroup_id, 7, "in the next table");
        // Gone from the next table: the row at its place.
        let mut without = two_rows();
        without.rows.retain(|r| r.cgroup_id != 7);
        view.show(without);
        assert_eq!(view.selected().unwrap().cgroup_id, 4242);
        view.show(table(Vec::new()));
        assert!(view.selected().is_none());
        let lines = screen(&mut view, 120, 10);
        assert_eq!(
            lines[1],
            "no cgroup was stopped by its CPU quota in this interval"
        );
    }

    #[test]
    fn the_filter_is_typed_after_a_slash_and_cleared_by_esc() {
        let mut view = View::default();
        view.show(two_rows());
        typed(&mut view, "/bat");
        let text = screen(&mut view, 200, 10).join("\n");
        assert!(text.contains("filter: bat_"), "{text}");
        assert!(text.contains("/batch") && !text.contains("/web"), "{text}");
        assert_eq!(view.selected().unwrap().cgroup_id, 7);
        // While typing, q and s are text; Backspace takes them back.
        typed(&mut view, "qs");
        assert_eq!(view.filter, "batqs");
        press(&mut view, KeyCode::Backspace);
        press(&mut view, KeyCode::Backspace);
        press(&mut view, KeyCode::Enter);
        let text = screen(&mut view, 200, 10).join("\n");
        assert!(
            text.contains("filter: bat ") && text.contains("/batch"),
            "{text}"
        );
        press(&mut view, KeyCode::Char('/'));
        press(&mut view, KeyCode::Esc);
        let text = screen(&mut view, 200, 10).join("\n");
        assert!(text.contains("/web") && text.contains("/batch"), "{text}");
        assert_eq!(view.selected().unwrap().cgroup_id, 7, "still /batch");
    }

    #[test]
    fn q_and_ctrl_c_end_the_run_other_events_do_not() {
        let mut view = View::default();
        view.show(two_rows());
        assert!(!view.event(&Event::Resize(80, 20)));
        assert!(!press(&mut view, KeyCode::Char('x')));
        assert!(press(&mut view, KeyCode::Char('q')));
        press(&mut view, KeyCode::Char('/'));
        let ctrl_c = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert!(view.event(&Event::Key(ctrl_c)), "also while typing");
        let first = screen(&mut View::default(), 120, 5);
        assert_eq!(first[0], "waiting for the first interval");
        assert!(first[4].starts_with("sort: wall"), "{first:#?}");
    }

    #[test]
    fn a_narrow_terminal_shows_whole_columns_from_the_left() {
        assert_eq!(fitting(&[10, 5, 5], 5), 1, "the cgroup column always");
        assert_eq!(fitting(&[10, 5, 5], 16), 1);
        assert_eq!(fitting(&[10, 5, 5], 17), 2);
        assert_eq!(fitting(&[10, 5, 5], 24), 3);
        let mut view = View::default();
        view.show(two_rows());
        let wide = screen(&mut view, 200, 6);
        assert!(wide[1].ends_with("QUOTA OF  NAME"), "{wide:#?}");
        // The mark and CGROUP STOPS/s GROUP/s P50 P99 MAX, 2 apart: 50 columns; 59 with PER-CPU.
        assert!(screen(&mut view, 59, 6)[1].ends_with("PER-CPU"));
        let narrow = screen(&mut view, 58, 6);
        let header: Vec<&str> = narrow[1].split_whitespace().collect();
        assert_eq!(
            header,
            ["CGROUP", "STOPS/s", "GROUP/s", "P50", "P99", "MAX"],
            "{narrow:#?}"
        );
        let row: Vec<&str> = narrow[2].split_whitespace().collect();
        assert_eq!(
            row,
            [">", "/web", "10.0", "9.0", "80.0ms", "80.0ms", "80.0ms"]
        );
    }
}
