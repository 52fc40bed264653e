import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import { ICommandPalette } from '@jupyterlab/apputils';
import { ISettingRegistry } from '@jupyterlab/settingregistry';
import { IStateDB } from '@jupyterlab/statedb';
import { IStatusBar } from '@jupyterlab/statusbar';
import { LabIcon } from '@jupyterlab/ui-components';
import { Widget } from '@lumino/widgets';

import { CheckpointsModel } from './model';
import { CheckpointsPanel } from './sidebar';

const PLUGIN_ID = 'nbckpt:plugin';
/** Where the sidebar remembers its root, in the workspace's state. */
const STATE_KEY = 'nbckpt:sidebar';

/** Command ids. */
export const CommandIDs = {
  open: 'nbckpt:open-sidebar',
  refresh: 'nbckpt:refresh'
} as const;

const checkpointIcon = new LabIcon({
  name: 'nbckpt:checkpoint',
  svgstr:
    '<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">' +
    '<path class="jp-icon3" fill="#616161" d="M5 3h11l3 3v15H5zm2 2v5h9V5zm2 1h2v3H9zm-2' +
    ' 7v6h10v-6z"/></svg>'
});

/** The status-bar text: saves and restores in flight and failures, or ''. */
function statusText(model: CheckpointsModel): string {
  const { saving, restoring, failed } = model.totals;
  const parts = [];
  if (saving) {
    parts.push(`${saving} saving`);
  }
  if (restoring) {
    parts.push(`${restoring} restoring`);
  }
  if (failed) {
    parts.push(`${failed} failed`);
  }
  return parts.length ? `Checkpoint: ${parts.join(', ')}` : '';
}

/**
 * The status-bar item: saves in flight and failures in every running cluster's root
 * (and the sidebar's root), whichever root the sidebar shows.
 */
class SavingStatus extends Widget {
  constructor(model: CheckpointsModel, onClick: () => void) {
    super();
    this.addClass('nbckpt-statusbar');
    this.node.addEventListener('click', onClick);
    model.changed.connect(() => {
      this.node.textContent = statusText(model);
      this.node.title = [
        'nbckpt: click to open the Checkpoints sidebar',
        ...model.totals.lines
      ].join('\n');
    });
  }
}

/** The root a workspace's state remembers, if it holds one. */
function rememberedRoot(value: unknown): string | null {
  if (typeof value === 'object' && value !== null && 'root' in value) {
    const root = (value as { root: unknown }).root;
    return typeof root === 'string' ? root : null;
  }
  return null;
}

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'A Checkpoints sidebar over the nbckpt server routes: steps, states and per-host save timelines.',
  autoStart: true,
  optional: [
    ICommandPalette,
    ISettingRegistry,
    IStatusBar,
    ILayoutRestorer,
    IStateDB
  ],
  activate: (
    app: JupyterFrontEnd,
    palette: ICommandPalette | null,
    settingRegistry: ISettingRegistry | null,
    statusBar: IStatusBar | null,
    restorer: ILayoutRestorer | null,
    state: IStateDB | null
  ) => {
    const model = new CheckpointsModel();
    let defaultRoot = '';
    const panel = new CheckpointsPanel(model);
    panel.title.icon = checkpointIcon;
    panel.title.caption = 'Checkpoints';
    app.shell.add(panel, 'left', { rank: 850 });
    restorer?.add(panel, panel.id);

    // The workspace remembers the root, so a reload shows the same one.
    model.rootChanged.connect((_, root) => {
      state?.save(STATE_KEY, { root }).catch(reason => {
        console.error('nbckpt: cannot remember the root', reason);
      });
    });

    const settingsLoaded = settingRegistry
      ? settingRegistry
          .load(PLUGIN_ID)
          .then(settings => {
            const apply = (s: ISettingRegistry.ISettings): void => {
              defaultRoot = String(s.get('defaultRoot').composite ?? '');
              model.refreshSeconds = Number(s.get('refreshSeconds').composite);
              model.idleRefreshSeconds = Number(
                s.get('idleRefreshSeconds').composite
              );
            };
            apply(settings);
            settings.changed.connect(apply);
          })
          .catch(reason => {
            console.error('nbckpt: cannot load settings', reason);
          })
      : Promise.resolve();

    // The first time the sidebar shows, choose its root: the one this workspace
    // remembers, else the configured one, else the root of the newest running
    // cluster; else none, and the list of roots stays open to choose from.
    let chosen = false;
    const chooseRoot = async (): Promise<void> => {
      if (chosen) {
        return;
      }
      chosen = true;
      const roots = model.loadRoots();
      const [saved] = await Promise.all([
        state?.fetch(STATE_KEY).catch(() => undefined),
        settingsLoaded
      ]);
      if (model.root !== null) {
        return; // chosen meanwhile (the status bar, or the user)
      }
      const remembered = rememberedRoot(saved);
      if (remembered !== null || defaultRoot) {
        await panel.openRoot(remembered ?? defaultRoot);
        return;
      }
      panel.showRoots(true);
      await roots;
      const newest = [...(model.roots?.clusters ?? [])]
        .reverse()
        .find(c => c.openable);
      if (newest && model.root === null) {
        await panel.openRoot(newest.root);
      }
    };
    const open = (): void => {
      app.shell.activateById(panel.id);
      // The root with something in flight or failed, if the sidebar shows none of them.
      const busy = model.totals.roots;
      const shown = model.checkpoints?.root ?? model.root;
      if (busy.length && (shown === null || !busy.includes(shown))) {
        chosen = true;
        void panel.openRoot(busy[0]);
      } else {
        void chooseRoot();
      }
    };
    panel.whenShown = () => void chooseRoot();
    if (panel.isVisible) {
      void chooseRoot();
    }
    // The status bar follows the running clusters from the start.
    void model.refresh();

    app.commands.addCommand(CommandIDs.open, {
      label: 'Open Checkpoints Sidebar',
      caption: 'Show the nbckpt checkpoints and save timelines',
      icon: checkpointIcon,
      execute: () => {
        app.shell.activateById(panel.id);
        void chooseRoot();
      }
    });
    app.commands.addCommand(CommandIDs.refresh, {
      label: 'Refresh Checkpoints',
      execute: () => model.refresh(true)
    });
    palette?.addItem({ command: CommandIDs.open, category: 'Checkpoints' });
    palette?.addItem({ command: CommandIDs.refresh, category: 'Checkpoints' });

    if (statusBar) {
      statusBar.registerStatusItem('nbckpt:saving', {
        item: new SavingStatus(model, open),
        align: 'left',
        rank: 100,
        isActive: () => statusText(model) !== '',
        activeStateChanged: model.changed
      });
    }
  }
};

export default plugin;
