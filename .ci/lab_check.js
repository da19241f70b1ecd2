// Helpers the browser check installs in the JupyterLab page (window.labcheck).
// They read JupyterLab's own objects (window.jupyterapp, exposed by the
// check's private server) and drive it through its commands, as the menus do.
// The clicks themselves are real mouse clicks, made by Playwright.
(() => {
  const app = window.jupyterapp;
  const state = { runs: {} };

  const mainWidgets = () => Array.from(app.shell.widgets('main'));
  const byPath = path => mainWidgets().find(w => w.context && w.context.path === path);
  const codeCells = w => w.content.widgets.filter(c => c.model.type === 'code');
  const kindOf = w => {
    if (!w) return 'nothing';
    if (w.node.classList.contains('jp-NotebookPanel')) return 'notebook';
    if (w.content && w.content.node.classList.contains('jp-MarkdownViewer')) return 'Markdown Preview';
    if (w.content && w.content.node.classList.contains('jp-FileEditor')) return 'editor';
    if (w.content && w.content.mimeType) return `viewer for ${w.content.mimeType}`;
    return w.content ? w.content.node.className : w.node.className;
  };

  async function open(path, factory) {
    const widget = await app.commands.execute('docmanager:open', { path, factory });
    await widget.context.ready;
    app.shell.activateById(widget.id);
    return { id: widget.id, kind: kindOf(widget) };
  }

  async function kernelReady(path) {
    const w = byPath(path);
    await w.sessionContext.ready;
    const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
    if (kernel) await kernel.info;
    return !!kernel;
  }

  function openPaths() {
    return mainWidgets().filter(w => w.context).map(w => w.context.path);
  }

  function current() {
    const w = app.shell.currentWidget;
    return { path: w && w.context ? w.context.path : null, kind: kindOf(w) };
  }

  function activate(path) {
    const w = byPath(path);
    if (w) app.shell.activateById(w.id);
    return !!w;
  }

  // Close a document without saving it; a notebook's kernel is shut down first
  // (once it has started: closing a notebook whose kernel is still starting leaves it running).
  async function close(path) {
    const w = byPath(path);
    if (!w) return false;
    if (w.sessionContext) {
      await w.sessionContext.ready;
      await w.sessionContext.shutdown();
    }
    w.context.model.dirty = false; // the check never saves: the stored notebook stays as it is
    w.close();
    return true;
  }

  async function startRun(path) {
    const w = byPath(path);
    app.shell.activateById(w.id);
    await w.sessionContext.ready;
    const kernel = w.sessionContext.session.kernel;
    await kernel.info; // the kernel has answered kernel_info: it is up
    await app.commands.execute('notebook:clear-all-cell-outputs');
    state.runs[path] = { done: false, ok: null };
    app.commands.execute('notebook:run-all-cells').then(
      ok => { state.runs[path] = { done: true, ok }; },
      err => { state.runs[path] = { done: true, ok: false, error: String(err) }; });
    return codeCells(w).length;
  }

  function runState(path) {
    const w = byPath(path);
    const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
    const cells = codeCells(w);
    return {
      ...state.runs[path],
      status: kernel ? kernel.status : 'none',
      running: cells.filter(c => c.model.executionState === 'running').length,
      counts: cells.map(c => c.model.executionCount),
    };
  }

  // Errors, stderr and figures in the outputs the run produced, by cell index.
  function outputs(path) {
    const w = byPath(path);
    const found = { errors: [], stderr: [], figures: [] };
    w.content.widgets.forEach((cell, index) => {
      if (cell.model.type !== 'code') return;
      const area = cell.model.outputs;
      for (let n = 0; n < area.length; n++) {
        const out = area.get(n).toJSON();
        if (out.output_type === 'error') found.errors.push({ index, text: `${out.ename}: ${out.evalue}` });
        if (out.output_type === 'stream' && out.name === 'stderr') {
          found.stderr.push({ index, text: [].concat(out.text).join('').slice(0, 200) });
        }
        if (out.data && out.data['image/png']) found.figures.push(index);
      }
    });
    return found;
  }

  // The images of one cell, once it is scrolled into view (windowing attaches it).
  async function images(path, index) {
    const w = byPath(path);
    const cell = w.content.widgets[index];
    await w.content.scrollToCell(cell, 'center');
    return Array.from(cell.node.querySelectorAll('.jp-OutputArea-output img'))
      .map(img => ({ complete: img.complete, width: img.naturalWidth, height: img.naturalHeight }));
  }

  function localHref(a) {
    const href = a.getAttribute('href') || '';
    if (href.startsWith('#')) return { path: null, fragment: href };
    const url = new URL(a.href, location.href);
    const base = JSON.parse(document.getElementById('jupyter-config-data').textContent).baseUrl;
    const files = new URL(`${base}files/`, location.origin).pathname;
    if (url.origin !== location.origin || !url.pathname.startsWith(files)) return null;
    return { path: decodeURIComponent(url.pathname.slice(files.length)), fragment: url.hash };
  }

  function authoredLinks(root) {
    return Array.from(root.querySelectorAll('.jp-RenderedMarkdown a[href], .jp-RenderedHTMLCommon a[href]'))
      .filter(a => !a.classList.contains('jp-InternalAnchorLink'));
  }

  // Mark the n-th authored link of a document (or of one notebook cell) for a click;
  // return where it points, or every link when n is null.
  async function links(path, cellIndex, n) {
    const w = byPath(path);
    let root = w.content.node;
    if (cellIndex !== null) {
      const cell = w.content.widgets[cellIndex];
      await w.content.scrollToCell(cell, 'center');
      root = cell.node;
    }
    document.querySelectorAll('[data-labcheck-link]').forEach(a => a.removeAttribute('data-labcheck-link'));
    const all = authoredLinks(root).map(a => ({ a, local: localHref(a), href: a.getAttribute('href') }));
    if (n === null) return all.map(({ local, href }) => ({ local, href }));
    all[n].a.setAttribute('data-labcheck-link', 'next');
    return { local: all[n].local, href: all[n].href };
  }

  function markdownCells(path) {
    const w = byPath(path);
    return w.content.widgets.map((c, index) => ({ index, type: c.model.type, id: c.model.id,
      source: c.model.sharedModel.getSource() })).filter(c => c.type === 'markdown');
  }

  // Where a fragment's target is, relative to the visible part of the current document.
  function landing(path, fragment) {
    const w = app.shell.currentWidget;
    if (!w || !w.context || w.context.path !== path) return { open: false, current: current() };
    let target = null;
    if (fragment.startsWith('#cell-id=')) {
      const id = decodeURIComponent(fragment.slice('#cell-id='.length));
      const cell = w.content.widgets && w.content.widgets.find(c => c.model.id === id);
      target = cell ? cell.node : null;
    } else if (fragment) {
      const name = CSS.escape(decodeURIComponent(fragment.slice(1)));
      target = w.node.querySelector(`[data-jupyter-id="${name}"], [id="${name}"]`);
    }
    const view = w.content.node.getBoundingClientRect();
    if (!fragment) return { open: true, kind: kindOf(w), found: true, inView: true };
    if (!target) return { open: true, kind: kindOf(w), found: false, inView: false };
    const top = target.getBoundingClientRect().top - view.top;
    return { open: true, kind: kindOf(w), found: true, top: Math.round(top),
             height: Math.round(view.height), inView: top >= -2 && top <= view.height - 16 };
  }

  // Follow a link as JupyterLab's own link handler does (for anchors no link names).
  function follow(path, fragment) {
    return app.commands.execute('rendermime:handle-local-link', { path, id: fragment });
  }

  window.labcheck = { open, kernelReady, openPaths, current, activate, close, startRun, runState, outputs,
                      images, links, markdownCells, landing, follow };
})();
